"""The built-in faults, one module per area of the specification."""
