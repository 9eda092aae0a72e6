//! Integration tests of the engine, one module per concern (a single test
//! binary keeps link time down).

mod bad_input;
mod batch_log;
mod churn;
mod cold_pages;
mod common;
mod compact;
mod concurrency;
mod copy;
mod corruption;
mod digest;
mod epochs;
mod filters;
mod model;
mod stop;
mod storage;
mod transactions;
mod vacuum;
