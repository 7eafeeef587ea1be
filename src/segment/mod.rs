//! Segments: store targets holding large objects whole, each with its own extent allocator.
//! This layer stores opaque extents and never sees keys.

pub mod extent;
pub mod label;
pub mod mount;
pub mod spec;
pub mod storage;
pub mod target;

pub use extent::{Extent, ExtentAllocator, NoSpace};
pub use mount::{mount_all, MountFailure, MountedTarget, TargetStorage};
pub use spec::{FileLocality, SegmentSpec};
pub use storage::{FileStorage, MemStorage, MountOrigin};
pub use target::{HostId, TargetKind, TargetSpec};
