"""Local Kubernetes control plane from Go modules, and a process pod runner."""
