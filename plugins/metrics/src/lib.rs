//! Metrics sinks: console, JSONL and TensorBoard event files
