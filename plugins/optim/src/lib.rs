//! Optimizers (Adam/AdamW, SGD), gradient clipping, LR and weight-decay schedules
