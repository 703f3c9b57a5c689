"""Stage modules: read inputs, call the library, validate and write outputs."""
