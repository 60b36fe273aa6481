//! The code itself: the layout of the source tree, and the fuzz targets' corpus and
//! properties replayed.
//!
//! One test binary per area (each links the whole crate once); the shared harness is
//! `tests/common/`.

mod docs;
mod fuzz_replay;
mod layout;
