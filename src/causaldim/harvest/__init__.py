"""The one model pass and its store: plan (what is harvested, checked before any work),
model_pass (residuals, gradients and probe products of a batch), store (the shards and
manifest on disk), write (harvesting a plan into its stores)."""

from .plan import Plan, plan
from .store import Store, write_store
from .write import HarvestResult, harvest

__all__ = ["HarvestResult", "Plan", "Store", "harvest", "plan", "write_store"]
