//! Integration tests live in tests/suite; this library is empty.
