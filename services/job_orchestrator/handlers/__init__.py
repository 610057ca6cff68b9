"""The job orchestrator's consumers, one module each (validate → load → decide → append)."""
