"""The web manager on port 7999: dashboard, control, settings, logs, detection."""

from vllm_offload.manager.app import ManagerSettings, create_app

__all__ = ["ManagerSettings", "create_app"]
