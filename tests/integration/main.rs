//! The integration test binary: every data-driven suite is a module here.
