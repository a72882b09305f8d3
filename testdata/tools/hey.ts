// A back-office script against the client @hey-api/openapi-ts generates
// from the running service's /openapi.json (gen-hey/, made by the test).
// The document's servers entry is "/": the base URL and the key are set
// once, at run time.
import { client } from "./gen-hey/client.gen.js";
import { createPet, listPets, getPet, listOrders, getHealth, getIndex, getOpenApi, getOpenApijson } from "./gen-hey/sdk.gen.js";

client.setConfig({ baseUrl: process.env.PETSTORE_URL ?? "", auth: () => process.env.PETSTORE_KEY ?? "" });
const out: Record<string, unknown> = {};

const created = await createPet({ body: { name: "Rex", categoryId: 1 } });
out.created = [created.response?.status, created.data];
const listed = await listPets({ query: { status: "available", limit: 10 } });
out.listed = [listed.response?.status, listed.data];
const got = await getPet({ path: { petId: 1 } });
out.got = [got.response?.status, got.data];
const bad = await createPet({ body: { name: "", categoryId: 1 } });
out.badRequest = [bad.response?.status, bad.error];
const orders = await listOrders();
out.orders = [orders.response?.status, orders.error];
const health = await getHealth();
out.health = [health.response?.status, health.data];
out.index = (await getIndex()).response?.status;
// The YAML form has no schema: it is read as text, which is the JSON
// document (JSON is YAML 1.2).
const yaml = await getOpenApi({ parseAs: "text" });
out.openapiYaml = JSON.parse(String(yaml.data)).openapi;
const doc = await getOpenApijson();
out.openapi = doc.data?.openapi;

console.log(JSON.stringify(out));
