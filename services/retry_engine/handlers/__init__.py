"""The retry engine's consumers, one module each (validate → load → decide → append)."""
