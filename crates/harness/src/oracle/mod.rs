//! The idempotency model a history of requests and answers is judged against
//! (docs/PROTOCOL.md §11): what a history is ([`history`]), the model ([`model`]), and how two
//! JSON answers are compared ([`json`]).
//!
//! Pure: nothing here sends a request. The black-box runner judges a scenario file that asks
//! for the model (`[expect] model = true`) with it, and `check` judges generated histories.
//!
//! Order inside the folder, bottom to top: `json` and `history`, then `model`.

pub mod history;
pub mod json;
pub mod model;
