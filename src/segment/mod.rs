//! Segments: store targets holding large objects whole, each with its own extent allocator.
//! This layer stores opaque extents and never sees keys.

pub mod extent;
pub mod spec;
pub mod storage;

pub use extent::{Extent, ExtentAllocator, NoSpace};
pub use spec::{FileLocality, SegmentSpec};
pub use storage::{FileStorage, MemStorage};
