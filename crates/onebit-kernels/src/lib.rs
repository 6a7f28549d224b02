//! CPU kernels: the math of the forward, behind small functions a GPU or NPU
//! backend can mirror. Scalar references live beside any SIMD path and the
//! tests hold one to the other.

mod arena;
pub mod attention;
pub mod f16mm;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod rope;

pub use f16mm::F16Matrix;
pub use isa::Isa;
pub use matmul::{matmul, matmul_each, matmul_many, Precision, QMatrix};
pub use pool::Pool;
