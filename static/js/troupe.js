/* Behaviour every page shares, here rather than in the markup: the Content-Security-Policy allows
   no inline script or event handler (webapp/settings.py CONTENT_SECURITY_POLICY). */
(function () {
  // <select data-submit-on-change>: choosing an option submits its form (the team switcher).
  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el.matches && el.matches("select[data-submit-on-change]") && el.form) el.form.submit();
  });
})();
