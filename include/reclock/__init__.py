"""reclock: bring streams with their own gauges of progress onto one IntoTime timeline."""
