//! Raw serde model of the YAML file (filled in by the config work).
