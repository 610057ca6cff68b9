"""The timeline's consumers, one module each: committed events, and GPU telemetry."""
