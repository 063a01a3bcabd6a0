//! CPU implementations over plain f32 slices (the reference for every other backend).

pub mod attention;
pub mod bitmask;
pub mod conv;
pub mod gated_delta;
pub mod linear;
pub mod norm;
pub mod prep;
pub mod sample;
