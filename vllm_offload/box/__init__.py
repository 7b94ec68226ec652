"""Several models on one box (this package; several boxes are cluster_router's, behind a
router): the residency switcher, the engine processes, the front door that routes by model
name, and its control API for the manager."""
