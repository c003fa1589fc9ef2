//! Placement: where a model instance runs. Pure functions over plain data.
