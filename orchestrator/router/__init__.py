"""PD router: request -> pair (policy) -> prefill + decode legs (dispatch) -> answer or relayed stream; HTTP ingress."""
