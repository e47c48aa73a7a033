import type { RegisteredFlow } from '../../../../schemas/index.js';

export const xml = (s: string) =>
  s.replace(
    /[<>&"']/g,
    (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;', "'": '&apos;' })[c]!,
  );

const stepSkill = (s: RegisteredFlow['steps'][number]) =>
  'skill_key' in s && typeof s.skill_key === 'string' ? s.skill_key : '';

/** The compact (non-verbose) XML an agent receives for a chosen flow. */
export function buildPrompt(f: RegisteredFlow): string {
  const steps = f.steps
    .map(
      (s, i) =>
        `<step n="${i + 1}"${stepSkill(s) ? ` skill="${xml(stepSkill(s))}"` : ''}>${xml(s.name)}</step>`,
    )
    .join('');
  return (
    `<flow id="${f.id}" name="${xml(f.name)}">` +
    (f.description ? `<description>${xml(f.description)}</description>` : '') +
    (f.condition ? `<condition>${xml(f.condition)}</condition>` : '') +
    (steps ? `<steps>${steps}</steps>` : '') +
    (f.agent_prompt_hint ? `<hint>${xml(f.agent_prompt_hint)}</hint>` : '') +
    `</flow>`
  );
}

/** Prompts cached by flow id and registration time: a re-registered flow gets a fresh prompt. */
export class PromptCache {
  private readonly cache = new Map<string, { at: number; xml: string }>();
  hits = 0;
  get(f: RegisteredFlow): string {
    const c = this.cache.get(f.id);
    if (c && c.at === f.registered_at) {
      this.hits++;
      return c.xml;
    }
    const out = buildPrompt(f);
    this.cache.set(f.id, { at: f.registered_at, xml: out });
    return out;
  }
  delete(id: string): void {
    this.cache.delete(id);
  }
}

/** The candidates' metadata for the model: name, description, condition, desired effects. */
export function candidatesXml(flows: RegisteredFlow[]): string {
  return (
    '<candidates>' +
    flows
      .map(
        (f) =>
          `<flow id="${f.id}"><name>${xml(f.name)}</name><description>${xml(f.description)}</description><condition>${xml(f.condition)}</condition>` +
          `<desired_effects>${f.desired_effects.map((e) => `<effect>${xml(e)}</effect>`).join('')}</desired_effects></flow>`,
      )
      .join('') +
    '</candidates>'
  );
}

export const SYSTEM_PROMPT = [
  'You route a user request to deterministic flows.',
  'Pick the flows whose condition best matches the request; a request may need several flows.',
  'Use desired_effects to break ties between similar flows.',
  'Only use ids from the candidate list.',
  'Answer with only a raw JSON array of the chosen ids, e.g. ["id1"]; [] when none fits.',
].join('\n');

export function userPrompt(query: string, summaries: readonly string[], flows: RegisteredFlow[]): string {
  const context = summaries.length
    ? `\n<recent_episodes>${summaries.map((s) => `<episode>${xml(s)}</episode>`).join('')}</recent_episodes>`
    : '';
  return `<request>${xml(query)}</request>${context}\n${candidatesXml(flows)}`;
}
