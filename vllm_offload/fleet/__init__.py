"""Several models on one box: the residency switcher, the engine processes, the front
door that routes by model name, and its control API for the manager."""
