"""Model versions at run time: hot loads and unloads (hotswap), golden sets, and the lazy-model pool."""
