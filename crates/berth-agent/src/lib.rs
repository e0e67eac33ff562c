//! The in-pod Berth agent: its gRPC service, auth layer and the client the operator uses.
//! Built by the agent issue; empty until then.
