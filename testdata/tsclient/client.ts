// A back-office script written against the client that openapi-typescript
// generates from the running service's /openapi.json (api.d.ts, made by
// TestGeneratedTypeScriptClient) with openapi-fetch. The test type-checks
// it with tsc --strict, runs it with node against a real service, and
// checks what it prints. The base URL and key come from the command line.
import createClient from "openapi-fetch";
import type { paths, components } from "./api.js";

// Node's own globals, without @types/node.
declare const process: { argv: string[] };

type Pet = components["schemas"]["Pet"];
type NewPet = components["schemas"]["NewPet"];
type ApiError = components["schemas"]["Error"];

const [base, key] = process.argv.slice(2) as [string, string];
const client = createClient<paths>({ baseUrl: base, headers: { Authorization: `Bearer ${key}` } });
const out: Record<string, unknown> = {};

// Create: status is optional in the generated NewPet.
const rex: NewPet = { name: "Rex", categoryId: 1 };
const created = await client.POST("/v1/pets", { body: rex, params: { header: { "Idempotency-Key": "ts-rex" } } });
if (!created.data) throw new Error(`create: ${created.response.status}`);
const pet: Pet = created.data;
out.created = pet;
out.location = created.response.headers.get("Location");
for (const name of ["Tom", "Kit", "Max"]) {
  await client.POST("/v1/pets", { body: { name, categoryId: 2, status: "sold" } });
}

// The sold ones, two a page, following the Link header to the last.
const listSold = (after?: number) => client.GET("/v1/pets", { params: { query: { limit: 2, status: "sold", after } } });
const pages: number[][] = [];
for (let page = await listSold(); ; ) {
  if (!page.data) throw new Error(`list: ${page.response.status}`);
  pages.push(page.data.map((p: Pet) => p.id));
  const next = page.response.headers.get("Link")?.match(/^<([^>]+)>; rel="next"$/)?.[1];
  if (next === undefined) break;
  page = await listSold(Number(new URL(next, base).searchParams.get("after")));
}
out.soldPages = pages;

// Get (deprecated), by the create's id.
const got = await client.GET("/v1/pets/{petId}", { params: { path: { petId: pet.id } } });
out.got = got.data;
out.sunset = got.response.headers.get("Sunset");

// Error bodies, typed as the Error schema.
const bad = await client.POST("/v1/pets", { body: { name: " ", categoryId: 1 } });
const badRequest: ApiError | undefined = bad.error;
out.badRequest = badRequest;
out.notFound = (await client.GET("/v1/pets/{petId}", { params: { path: { petId: 99 } } })).error;
const denied = await createClient<paths>({ baseUrl: base }).GET("/v1/pets", {});
out.unauthorized = denied.error;
out.challenge = denied.response.headers.get("WWW-Authenticate");

console.log(JSON.stringify(out));
