//! Native checkpoint format: safetensors shards + JSON metadata, atomic writes
