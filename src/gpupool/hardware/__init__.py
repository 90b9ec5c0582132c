"""Layer 1: GPU facts, slice and inventory types, partition planning. Standard library only."""
