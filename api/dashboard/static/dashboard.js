// Barge dashboard: live updates without a reload, and nothing else.
// A [data-live] region is re-fetched as server-rendered HTML every POLL_MS; the jobs
// table is rebuilt from the JSON endpoint named by its data-poll. Text is set through
// textContent, never parsed as HTML, except the server's own rendered fragments.
"use strict";
(function () {
  const POLL_MS = 2000;

  function duration(s) {
    if (s === null || s === undefined) return "?";
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    const two = (n) => String(n).padStart(2, "0");
    if (h) return h + "h" + two(m) + "m";
    if (m) return m + "m" + two(sec) + "s";
    return sec + "s";
  }

  function rate(perS, unit) {
    if (perS === null || perS === undefined) return "-";
    return (perS < 100 ? perS.toFixed(1) : Math.round(perS).toLocaleString()) + " " + unit + "/s";
  }

  function cell(row, text, className) {
    const td = row.insertCell();
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function jobRow(body, job) {
    const row = body.insertRow();
    row.dataset.job = job.id;
    const link = document.createElement("a");
    link.href = "/dashboard/jobs/" + job.id;
    link.textContent = job.id.slice(0, 12);
    row.insertCell().appendChild(link);
    const status = document.createElement("span");
    status.className = "status " + job.status;
    status.textContent = job.status;
    row.insertCell().appendChild(status);
    const progress = row.insertCell();
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = job.percent;
    const count = document.createElement("span");
    count.className = "num";
    count.textContent = " " + job.rows_done + "/" + job.rows_total;
    progress.append(bar, count);
    cell(row, rate(job.rows_per_s, "rows"), "num");
    cell(row, job.is_finished ? "-" : duration(job.eta_s), "num");
    cell(row, job.model);
    cell(row, job.mode);
    cell(row, duration(job.age_s), "num");
    cell(row, job.owner_name || "-");
    cell(row, job.schedule || "-");
  }

  // New jobs push the first page's last ones onward: the next page starts after the last shown.
  function olderLink(nextBefore) {
    const link = document.getElementById("older-jobs");
    if (!link) return;
    link.hidden = !nextBefore;
    if (!nextBefore) return;
    const url = new URL(link.href);
    url.searchParams.set("before", nextBefore);
    link.href = url.pathname + url.search;
  }

  async function pollJobs(body) {
    const answer = await fetch(body.dataset.poll, { credentials: "same-origin" });
    if (!answer.ok) return;
    const { jobs, next_before: nextBefore } = await answer.json();
    body.replaceChildren();
    if (!jobs.length) {
      const row = body.insertRow();
      row.className = "empty";
      cell(row, "No jobs to show.").colSpan = 10;
    }
    jobs.forEach((job) => jobRow(body, job));
    olderLink(nextBefore);
    body.dataset.polled = String(Number(body.dataset.polled || 0) + 1);
  }

  // Returns false once the region says nothing more will change ([data-settled]).
  async function pollRegion(region) {
    if (region.querySelector("[data-settled]")) return false;
    const answer = await fetch(region.dataset.live, { credentials: "same-origin" });
    if (answer.ok) {
      region.innerHTML = await answer.text();
      region.dataset.polled = String(Number(region.dataset.polled || 0) + 1);
    }
    return true;
  }

  function every(task) {
    const run = () => task().then((again) => again !== false, () => true)
      .then((again) => { if (again) setTimeout(run, POLL_MS); });
    setTimeout(run, POLL_MS);
  }

  const jobsBody = document.getElementById("jobs-body");
  if (jobsBody) every(() => pollJobs(jobsBody));
  document.querySelectorAll("[data-live]").forEach((region) => every(() => pollRegion(region)));
})();
