"""Flow-level building blocks: constants, policies."""
