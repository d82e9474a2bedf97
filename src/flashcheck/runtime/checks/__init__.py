"""The runtime detectors (FC2xx) and the workspace property (FC302): one module per check, holding its page."""
