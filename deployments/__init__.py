"""Ray Serve deployments: engine workers and the PD router."""
