//! Collection changes: one key each, one transaction each, conditional on
//! the key's `create_revision` (create) or `mod_revision` (change, delete);
//! and the operator's drain marks, one key per node.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use shoal_proto::{CollectionName, NodeId};

use super::codec;
use super::shared::{Shared, header_revision};
use crate::metadata::{Collection, MetaError, Revision};

pub(super) async fn create(shared: &Shared, c: Collection) -> Result<Revision, MetaError> {
    check(&c)?;
    let key = shared.keys.collection(&c.name);
    let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        key,
        codec::encode_collection(&c)?,
        None,
    )]);
    let resp = shared.call(&format!("create collection {}", c.name), shared.client.kv_client().txn(txn)).await?;
    if !resp.succeeded() {
        return Err(MetaError::AlreadyExists(format!("collection {}", c.name)));
    }
    let revision = header_revision(resp.header())?;
    shared.catch_up(revision).await;
    Ok(revision)
}

pub(super) async fn update(shared: &Shared, c: Collection, expected: Revision) -> Result<Revision, MetaError> {
    check(&c)?;
    let key = shared.keys.collection(&c.name);
    let put = TxnOp::put(key.clone(), codec::encode_collection(&c)?, None);
    let resp =
        shared.call(&format!("update collection {}", c.name), shared.client.kv_client().txn(unchanged_since(&key, expected, put))).await?;
    if !resp.succeeded() {
        return Err(refusal(&c.name, expected, &resp));
    }
    let revision = header_revision(resp.header())?;
    shared.catch_up(revision).await;
    Ok(revision)
}

pub(super) async fn delete(shared: &Shared, name: CollectionName, expected: Revision) -> Result<(), MetaError> {
    let key = shared.keys.collection(&name);
    let txn = unchanged_since(&key, expected, TxnOp::delete(key.clone(), None));
    let resp = shared.call(&format!("delete collection {name}"), shared.client.kv_client().txn(txn)).await?;
    if !resp.succeeded() {
        return Err(refusal(&name, expected, &resp));
    }
    shared.catch_up(header_revision(resp.header())?).await;
    Ok(())
}

/// Puts or deletes `drains/{node}`: no condition, both are idempotent.
pub(super) async fn set_draining(shared: &Shared, node: NodeId, draining: bool) -> Result<Revision, MetaError> {
    let key = shared.keys.drain(&node);
    let mut kv = shared.client.kv_client();
    let revision = if draining {
        let resp = shared.call(&format!("mark node {node} draining"), kv.put(key, codec::encode_drain()?, None)).await?;
        header_revision(resp.header())?
    } else {
        let resp = shared.call(&format!("unmark node {node} draining"), kv.delete(key, None)).await?;
        header_revision(resp.header())?
    };
    shared.catch_up(revision).await;
    Ok(revision)
}

fn check(c: &Collection) -> Result<(), MetaError> {
    c.check().map_err(|e| MetaError::Invalid(format!("collection {}: {e}", c.name)))
}

/// `op` if the key exists and was last changed at `expected`; else reads
/// the key, to tell why.
fn unchanged_since(key: &str, expected: Revision, op: TxnOp) -> Txn {
    Txn::new()
        // A missing key has mod_revision 0: without the first compare, a
        // change "based on" revision 0 would create the collection.
        .when([Compare::version(key, CompareOp::Greater, 0), Compare::mod_revision(key, CompareOp::Equal, expected)])
        .and_then([op])
        .or_else([TxnOp::get(key, None)])
}

/// Why an `unchanged_since` transaction did nothing, from its read.
fn refusal(name: &CollectionName, expected: Revision, resp: &TxnResponse) -> MetaError {
    let found = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.mod_revision()),
        TxnOpResponse::Put(_) | TxnOpResponse::Delete(_) | TxnOpResponse::Txn(_) => None,
    });
    match found {
        Some(found) => MetaError::Conflict { what: format!("collection {name}"), expected, found },
        None => MetaError::NotFound(format!("collection {name}")),
    }
}
