//! Parallel strategy (rank grid, DP gradient reduction), single-rank communicator, pipeline schedules
