// A back-office script written against the client that openapi-typescript
// generates from the running service's /openapi.json (api.d.ts, made by
// the test). clients_test.go type-checks it with tsc --strict, runs it
// against a real server, and checks what it prints.
import createClient from "openapi-fetch";
import type { paths, components } from "./api.js";

type Pet = components["schemas"]["Pet"];
type NewPet = components["schemas"]["NewPet"];

const base = process.env.PETSTORE_URL ?? "";
const key = process.env.PETSTORE_KEY ?? "";
const client = createClient<paths>({ baseUrl: base, headers: { Authorization: `Bearer ${key}` } });
const out: Record<string, unknown> = {};

// Create: status is optional in the generated NewPet type.
const rex: NewPet = { name: "Rex", categoryId: 1 };
const created = await client.POST("/v1/pets", { body: rex });
if (!created.data) throw new Error(`create failed: ${created.response.status}`);
const pet: Pet = created.data;
out.created = pet;
out.location = created.response.headers.get("Location");

for (let i = 0; i < 4; i++) {
  await client.POST("/v1/pets", { body: { name: `Sold ${i}`, categoryId: 2, status: "sold" } });
}

// List with a status filter, following Link to the last page.
async function listSold(after: number | undefined): Promise<{ pets: Pet[]; next: string | null }> {
  const page = await client.GET("/v1/pets", {
    params: { query: { limit: 2, status: "sold", ...(after !== undefined ? { after } : {}) } },
  });
  if (!page.data) throw new Error(`list failed: ${page.response.status}`);
  const link: string | null = page.response.headers.get("Link");
  return { pets: page.data, next: link?.match(/^<([^>]+)>; rel="next"$/)?.[1] ?? null };
}
const pages: number[] = [];
let page = await listSold(undefined);
pages.push(page.pets.length);
while (page.next !== null) {
  const after: string | null = new URL(page.next, base).searchParams.get("after");
  page = await listSold(after === null ? undefined : Number(after));
  pages.push(page.pets.length);
}
out.soldPages = pages;

// Get (deprecated).
const got = await client.GET("/v1/pets/{petId}", { params: { path: { petId: pet.id } } });
out.got = got.data;
out.deprecation = got.response.headers.get("Deprecation");

// Typed errors: a 400 and a 401 carry the Error body.
const bad = await client.POST("/v1/pets", { body: { name: "", categoryId: 1 } });
out.badRequest = bad.error;
const anonymous = createClient<paths>({ baseUrl: base });
const denied = await anonymous.GET("/v1/pets", {});
out.unauthorized = denied.error;
out.unauthorizedStatus = denied.response.status;

// The document itself, as JSON.
const doc = await anonymous.GET("/openapi.json", {});
out.openapi = (doc.data as { openapi?: string } | undefined)?.openapi;

console.log(JSON.stringify(out));
