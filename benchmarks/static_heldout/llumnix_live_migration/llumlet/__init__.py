"""llumlet: one serving instance of a Llumnix-style cluster. Besides serving its own batch, an instance
can live-migrate running requests to another instance: KV blocks are sent in stages while the request
keeps decoding on the source, and only the last few blocks are sent after it is drained."""
