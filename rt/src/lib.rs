//! weft runtime
