"""Run.algorithm, copied out of the config snapshot (as environment and specialization are) so the
run list filters on it; existing runs read it from their snapshot."""

import yaml
from django.db import migrations, models


def backfill(apps, schema_editor):
    Run = apps.get_model("webapp", "Run")
    for run in Run.objects.filter(config_yaml__contains="algorithm: sft").only("pk", "config_yaml").iterator():
        try:
            tree = yaml.safe_load(run.config_yaml)
        except yaml.YAMLError:
            continue
        if isinstance(tree, dict) and tree.get("algorithm") == "sft":
            Run.objects.filter(pk=run.pk).update(algorithm="sft")


class Migration(migrations.Migration):

    dependencies = [
        ('webapp', '0014_run_cluster'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='algorithm',
            field=models.CharField(default='grpo', help_text='config.algorithm: grpo (own rollouts) or sft (conversations).', max_length=10),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
