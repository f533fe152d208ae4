"""JSON extraction: the reply is held to a JSON Schema, so it always parses and conforms.

``g.collect_json(schema=...)`` attaches the schema as a constraint (compiled once per schema and
model, off the event loop), runs the generator to the end and parses the reply. The default
schema asks for a person record; pass your own with ``--schema``.
"""

import json

from inferlet import Context, JsonSchema, Model, Sampler, runtime

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 60},
        "born": {"type": "integer", "minimum": 0, "maximum": 2100},
        "city": {"type": "string", "maxLength": 40},
        "known_for": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3},
        "colleagues": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["name", "born", "known_for"],
}


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    schema = PERSON
    if input.get("schema"):
        JsonSchema(input["schema"])  # a malformed schema fails here, saying what is wrong
        schema = json.loads(input["schema"])
    with Context(model) as ctx:
        ctx.system("Extract the requested facts from the user's text as JSON.")
        ctx.user(f"Schema: {json.dumps(schema)}\n\nText: {input['text']}")
        g = ctx.generate(Sampler.argmax(), max_tokens=input["max_tokens"])
        value = await g.collect_json(schema=schema)
        return {"value": value, "schema": schema, "tokens": g.tokens_generated}
