"""The real node: containerd + runc + CNI, a kubelet, kube-scheduler and kube-proxy
(docs/devcluster.md#the-real-node)."""
