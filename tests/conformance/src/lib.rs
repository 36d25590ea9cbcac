//! conformance placeholder
