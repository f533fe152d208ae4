// Generated from wit/ by sdk/javascript/typegen/gen-host-types.mjs (jco-transpile guest types,
// mapped to componentize-qjs's values). Do not edit: change wit/ and regenerate.
/// <reference path="./interfaces/pie-inferlet-adapter.d.ts" />
/// <reference path="./interfaces/pie-inferlet-context.d.ts" />
/// <reference path="./interfaces/pie-inferlet-grammar.d.ts" />
/// <reference path="./interfaces/pie-inferlet-inference.d.ts" />
/// <reference path="./interfaces/pie-inferlet-mcp.d.ts" />
/// <reference path="./interfaces/pie-inferlet-messaging.d.ts" />
/// <reference path="./interfaces/pie-inferlet-model.d.ts" />
/// <reference path="./interfaces/pie-inferlet-poll.d.ts" />
/// <reference path="./interfaces/pie-inferlet-runtime.d.ts" />
/// <reference path="./interfaces/pie-inferlet-scheduling.d.ts" />
/// <reference path="./interfaces/pie-inferlet-session.d.ts" />
/// <reference path="./interfaces/pie-inferlet-speculation.d.ts" />
/// <reference path="./interfaces/pie-inferlet-tools.d.ts" />
/// <reference path="./interfaces/pie-inferlet-types.d.ts" />
/// <reference path="./interfaces/pie-inferlet-zo.d.ts" />
declare module 'pie:inferlet/inferlet@0.1.0' {
  export type * as PieInferletAdapter010 from 'pie:inferlet/adapter@0.1.0'; // import pie:inferlet/adapter@0.1.0
  export type * as PieInferletContext010 from 'pie:inferlet/context@0.1.0'; // import pie:inferlet/context@0.1.0
  export type * as PieInferletGrammar010 from 'pie:inferlet/grammar@0.1.0'; // import pie:inferlet/grammar@0.1.0
  export type * as PieInferletInference010 from 'pie:inferlet/inference@0.1.0'; // import pie:inferlet/inference@0.1.0
  export type * as PieInferletMcp010 from 'pie:inferlet/mcp@0.1.0'; // import pie:inferlet/mcp@0.1.0
  export type * as PieInferletMessaging010 from 'pie:inferlet/messaging@0.1.0'; // import pie:inferlet/messaging@0.1.0
  export type * as PieInferletModel010 from 'pie:inferlet/model@0.1.0'; // import pie:inferlet/model@0.1.0
  export type * as PieInferletPoll010 from 'pie:inferlet/poll@0.1.0'; // import pie:inferlet/poll@0.1.0
  export type * as PieInferletRuntime010 from 'pie:inferlet/runtime@0.1.0'; // import pie:inferlet/runtime@0.1.0
  export type * as PieInferletScheduling010 from 'pie:inferlet/scheduling@0.1.0'; // import pie:inferlet/scheduling@0.1.0
  export type * as PieInferletSession010 from 'pie:inferlet/session@0.1.0'; // import pie:inferlet/session@0.1.0
  export type * as PieInferletSpeculation010 from 'pie:inferlet/speculation@0.1.0'; // import pie:inferlet/speculation@0.1.0
  export type * as PieInferletTools010 from 'pie:inferlet/tools@0.1.0'; // import pie:inferlet/tools@0.1.0
  export type * as PieInferletTypes010 from 'pie:inferlet/types@0.1.0'; // import pie:inferlet/types@0.1.0
  export type * as PieInferletZo010 from 'pie:inferlet/zo@0.1.0'; // import pie:inferlet/zo@0.1.0
  /**
  * Run the inferlet on `input` (JSON text); ok is its return value as JSON text, err a
  * description of the error that ended it.
  */
  export function run(input: string): string;
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}
