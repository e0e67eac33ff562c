//! The Berth operator: reconcile loop, pure state derivation, pod building, rejection recovery
//! and the agent handshake. Built by the operator issues; empty until then.
