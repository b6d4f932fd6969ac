"""SGLang/OpenAI HTTP API shared by router, sim and clients: request bodies, SSE reading, the streaming client."""
