//! A prepared filter answered from one point's payload: for fields
//! without an index (a scan the request allowed), for points a group
//! commit wrote before a delete by filter in the same transaction, and as
//! the model the indexes are tested against.

use serde_json::Value;

use crate::fields::value::{self, Extracted};

use super::prepare::{Key, Leaf, Node, Test};

/// True if the point `external` with payload object `payload` (if it
/// holds one) matches `node`.
pub(crate) fn matches(node: &Node, external: u64, payload: Option<&Value>) -> bool {
    match node {
        Node::All => true,
        Node::None => false,
        Node::Ids(ids) => ids.binary_search(&external).is_ok(),
        Node::Leaf(leaf) => leaf_matches(leaf, payload),
        Node::And(v) => v.iter().all(|n| matches(n, external, payload)),
        Node::Or(v) => v.iter().any(|n| matches(n, external, payload)),
        Node::Not(n) => !matches(n, external, payload),
    }
}

/// [`matches`] on a payload as the engine stores it.
pub(crate) fn matches_stored(node: &Node, external: u64, payload: Option<&[u8]>) -> bool {
    let object = payload.and_then(value::payload_object);
    matches(node, external, object.as_ref())
}

pub(crate) fn leaf_matches(leaf: &Leaf, payload: Option<&Value>) -> bool {
    let found = payload.and_then(|p| value::lookup(p, leaf.field.split('.')));
    test(&leaf.test, &value::extract(found, leaf.kind))
}

/// What a test says of an extracted value.
pub(crate) fn test(t: &Test, v: &Extracted<'_>) -> bool {
    match (t, v) {
        (Test::Empty, Extracted::Absent) => true,
        (Test::Empty, _) => false,
        (Test::Range { lo, hi }, Extracted::Number(n)) => lo <= n && n <= hi,
        (Test::Range { .. }, _) => false,
        (Test::Keys(keys), Extracted::Keywords(ks)) => keys.iter().any(|k| matches!(k, Key::Keyword(s) if ks.contains(&s.as_str()))),
        (Test::Keys(keys), Extracted::Number(n)) => keys.iter().any(|k| matches!(k, Key::Number(m) if m == n)),
        (Test::Keys(keys), Extracted::Bool(b)) => keys.iter().any(|k| matches!(k, Key::Bool(c) if c == b)),
        (Test::Keys(_), Extracted::Absent | Extracted::Other) => false,
    }
}
