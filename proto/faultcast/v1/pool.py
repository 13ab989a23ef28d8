"""The descriptor pool that faultcast's own generated stubs register their files and messages in,
instead of protobuf's default pool.

A program that imports faultcast (the trainer client, the service) may also load a third party's
stubs generated from another revision of the same .proto files: those register the same file names
(faultcast_api/v1/*.proto) and the same message names (faultcast.v1.Alert, ...) in the default
pool, and one pool holds one definition of each, so whichever came second failed to import. Each
pool holds its own; the wire names are the same, so both speak to the same service.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
