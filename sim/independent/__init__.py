"""A second fleet twin, written from the literature and the file formats alone (not from the rest of sim/).

    from faultcast.sim.independent import IndependentConfig, generate
    manifest = generate(Path("out/ind"), IndependentConfig(nodes=16, days=3, seed=1, acceleration=20))

`generate` writes telemetry.parquet, network.parquet, failures.csv and manifest.json (the files every
fleet source writes, faultcast.schemas). The world's free parameters are drawn from priors by the seed
(world.py lists each with its source); events.py draws the run's schedule (jobs, failures and their
precursors, near misses, outages, resets); generator.py turns it into telemetry chunk by chunk.
"""

from faultcast.sim.independent.twin import KIND, card_uuid, generate
from faultcast.sim.independent.world import IndependentConfig, World, draw_world

__all__ = ["KIND", "IndependentConfig", "World", "card_uuid", "draw_world", "generate"]
