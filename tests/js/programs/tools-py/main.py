"""The Python twin of programs/tools."""

from inferlet import Model, runtime, tools

WEATHER = {"name": "weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def main(input: dict) -> dict:
    model = Model.load(runtime.models()[0])
    return {
        "equip": tools.equip_prefix(model, [WEATHER]),
        "answer": tools.answer_prefix(model, "weather", {"temp": 21}),
        "matcher": tools.native_matcher(model, [WEATHER]) is not None,
    }
