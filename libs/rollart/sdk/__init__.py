"""The Worker/Cluster SDK: the programming model RollArt offers algorithm developers (see worker.py)."""

from .cluster import Cluster, ClusterError
from .worker import Worker, hw_mapping, register, register_serverless

__all__ = ["Cluster", "ClusterError", "Worker", "hw_mapping", "register", "register_serverless"]
