"""A process pod runner: kube-scheduler + kubelet for one node of the local control plane.

It binds pending pods to its node, runs each container's `command + args` as a local process
(images are not pulled) on the pod's own loopback address, and reports status like a kubelet.
See docs/podrunner.md.
"""
