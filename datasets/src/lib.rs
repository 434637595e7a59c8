//! Datasets: Megatron .bin/.idx reader, mock data, GPT samples
