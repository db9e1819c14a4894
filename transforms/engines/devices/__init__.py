"""One engine per device (`--devices`): which devices a machine's engines use and how each is pinned (plan.py,
pure), which engine a page goes to (routing.py, pure), and the engine over them that a worker process feeds
(pool.py: least work in flight, a dead device's pages moved to the others, the device restarted)."""
