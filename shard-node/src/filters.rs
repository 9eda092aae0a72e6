//! What a shard node says of its filters and field indexes on the wire:
//! index states, plans, scroll pages. (Filters themselves cross the wire
//! with `shoal_filter::wire`.)

use shoal_engine::{Explain, FieldIndexInfo, FieldState};
use shoal_filter::wire::field_type_to_proto;
use shoal_proto::v1;

pub(crate) fn field_state_to_proto(i: FieldIndexInfo) -> v1::FieldIndexState {
    let FieldIndexInfo { field, kind, state, points, other_type } = i;
    let (ready, indexed_below, of) = match state {
        FieldState::Ready => (true, 0, 0),
        FieldState::Building { indexed_below, of } => (false, u64::from(indexed_below), u64::from(of)),
    };
    v1::FieldIndexState { field, r#type: field_type_to_proto(kind) as i32, ready, indexed_below, of, points, other_type }
}

pub(crate) fn explain_to_proto(e: Explain) -> v1::Explain {
    let Explain { plan, matches, matches_exact, compared } = e;
    v1::Explain { plan: plan.name().to_owned(), matches, matches_exact, compared }
}
