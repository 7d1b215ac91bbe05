"""Dataset-level evaluators: COCO / LVIS mask AP and Boundary AP, COCO panoptic PQ and Boundary PQ.

See docs/protocols/boundary_ap_pq.md. They read the standard files, batch the
pixel work on the JAX device and accumulate on the host.
"""
