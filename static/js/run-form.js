/* The new-run form follows the algorithm picked: the fields only GRPO reads (K, tasks per step,
 * temperature, beta) or only SFT reads (the conversations, its batch size and length) are hidden for
 * the other algorithm. The lists come from the form (webapp.runs.services.ALGORITHM_FIELDS), and the
 * server ignores a hidden field's value the same way (RunForm.overrides). */
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  var algorithm = document.getElementById("id_algorithm");
  if (!form || !algorithm) return;
  // (getAttribute, not form.dataset: the form's own "dataset" field shadows that property)
  function names(attr) { return (form.getAttribute(attr) || "").split(" ").filter(Boolean); }
  function follow() {
    var sft = algorithm.value === "sft";
    names("data-grpo-only").forEach(function (name) { toggle(name, sft); });
    names("data-sft-only").forEach(function (name) { toggle(name, !sft); });
  }
  function toggle(name, hide) {
    var box = document.getElementById("field-" + name);
    if (box) box.hidden = hide;
  }
  algorithm.addEventListener("change", follow);
  follow();
})();
