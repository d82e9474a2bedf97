"""Doc pages of the runtime checks (FC2xx) and of the arena's property (FC302); importing them registers them."""
